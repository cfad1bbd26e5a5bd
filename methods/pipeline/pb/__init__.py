"""Pipelined Backpropagation with Spike Compensation and Linear Weight Prediction."""
