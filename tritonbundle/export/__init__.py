"""ONNX export: recipes that build a PyTorch module, the exporter, and the parity check."""
