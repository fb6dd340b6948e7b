"""The tokenizer of text models: ``plugin.py`` (config and files), ``model.py`` (served)."""
