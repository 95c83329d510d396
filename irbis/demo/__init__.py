"""Demo jobs behind `irbis demo` and friends."""
