"""A pipeline schedule as data: the IR (ops, actions, messages) and the one walk that order, time and bytes read."""
