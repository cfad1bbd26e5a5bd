"""Local Parallelism: chunks trained by local losses, and their parts (chunking, auxiliary heads)."""
