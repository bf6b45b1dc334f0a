"""Protocol runners, benchmarks and reports."""
