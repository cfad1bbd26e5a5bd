"""Delay compensation the asynchronous pipelines share (PB, APapo): weight prediction and spike compensation."""
