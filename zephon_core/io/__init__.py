"""I/O plumbing below sources and checkpoints, knowing no data format: file systems and object stores, byte
access, the node-local caches, the one atomic write."""
