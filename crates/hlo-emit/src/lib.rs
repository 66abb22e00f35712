//! Typed StableHLO builder over melior.
