"""The ground every room of the analysis stands on: typed event tables, interval arithmetic, what an event is
(compute, communication, copy) and the document's schema version. Imports nothing of the analysis."""
