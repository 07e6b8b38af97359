"""Pack format, reading, writing and delta code."""
