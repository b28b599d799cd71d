"""Pure torch math of the algorithms: no transformers, accelerate or I/O. Shapes are in each docstring."""
