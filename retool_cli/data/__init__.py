"""Data: problems in, clean examples out. dataset.py (MathExample, readers, cleaning, dedupe, splits),
synthetic.py (the built-in offline task), traces.py (SFT traces), decontam.py (benchmark overlap)."""
