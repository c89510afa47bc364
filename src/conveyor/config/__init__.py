"""The configuration: a YAML file, then environment variables, then flags; validated once.

``settings`` holds ``ServerConfig`` (the whole file) and ``load_config``; ``model_config``
the model entries it lists (one-shot kinds and generative models).
"""
