"""What-if projection: step time and time to target at other world sizes and networks, from measured costs."""
