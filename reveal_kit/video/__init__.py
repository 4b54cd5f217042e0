"""The video front end: decoding and the quality filter, L1 segmentation, subtitles, captions."""
