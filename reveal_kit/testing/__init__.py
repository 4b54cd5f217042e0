"""Fixtures the tests share: generated videos, bad inputs, benchmark annotation files, a fake chat server, a tiny memory."""
