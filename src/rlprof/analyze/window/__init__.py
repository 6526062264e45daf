"""One window's time: the device work each host range launched, its buckets (compute, communication, copies, idle),
operators, collectives, launch gaps and memory, one input at a time (`per_file`). Uses `inputs` and `tables`."""
