"""Datasets: the tensors methods read and the shared data order, the embedded and synthetic sources, CIFAR-10 and
ImageNet from local files, and the text corpus with its tokenization."""
