"""The generated benchmark: scripted timelines, their questions, rendered videos and subtitles."""
