"""Files (layer 1): sha256 hashing, the atomic store (write-then-rename), the output folder as a unit
(``outdir``: sibling staging, atomic switch, lock, confined manifest names, copies not hard links) and
byte-stable JSON for hashed artifacts (``stable``).

May import only layer 0 (errors); stdlib otherwise.
"""
