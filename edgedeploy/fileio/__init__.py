"""Files (layer 1): sha256 hashing and the atomic store (write-then-rename, publish).

May import only layer 0 (errors); stdlib otherwise.
"""
