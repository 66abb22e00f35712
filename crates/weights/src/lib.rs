//! Weights: placeholder filled by the checkpoint issue (#3).
