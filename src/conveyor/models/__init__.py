"""One-shot model backends behind one protocol (``base``): embedding, cross-encoder, synthetic.

``registry`` builds the model (or the engine's generator) a config entry names;
``text_tokenizer`` is a model's tokenizer as ``/tokenize`` uses it.
"""
