"""Q-FB: forward and backward lanes with quantized activations and 2-Step gradient compression."""
