"""The OpenAI-compatible API in front of Triton: ``/v1/embeddings`` and ``/v1/models`` for the
manifest's text-embedding models (``tritonbundle gateway``; :mod:`.app`, shapes in :mod:`.openai_api`)."""
