"""DP-SynRAG in JAX: a private document collection distilled once into a DP synthetic one."""

__version__ = "0.1.0"
