"""ONNX Runtime: ``plugin.py`` (config and files), ``model.py`` (the CPU server's served model)."""
