"""The build stage: manifest + traffic sample -> plan -> ONNX -> engines -> model repository.

Not to be confused with PyPA's ``build``: this package is only ever imported as
``tritonbundle.build``.
"""
