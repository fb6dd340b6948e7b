"""tritonbundle: a Triton Inference Server model repository plus its deployment bundle."""

__version__ = "0.1.0"
