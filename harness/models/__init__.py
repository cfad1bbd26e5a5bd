"""The built-in workloads' models, each an nn.Sequential of blocks a pipeline can cut: an MLP and a CNN, the CIFAR
ResNets, ResNet-50 and a GPT."""
