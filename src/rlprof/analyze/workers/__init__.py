"""Where the inputs are analysed: this machine's processes (a large file's byte ranges over every core) or a Ray
cluster (each file on the node that holds it). Uses `window` and `inputs`."""
