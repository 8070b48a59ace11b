"""What comes into a run and whether it is usable: prompt data, artifact detection, the input checks, and what a
process count needs of a config."""
