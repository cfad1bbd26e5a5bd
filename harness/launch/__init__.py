"""Launchers: local processes and SLURM through submitit, site profiles, run states, and running a list of specs."""
