"""Trace readers: each turns files into an EventTable plus metadata and warnings."""
