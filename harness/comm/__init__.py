"""Communication: the accounted communicator, the bounded forward channel, and the point-to-point tags."""
