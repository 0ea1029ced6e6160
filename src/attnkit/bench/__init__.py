"""The standard speed workloads (../shared/bench/WORKLOADS.md): the catalogue of workloads and peers, attnkit's
and each peer's adapters, the measuring process, the runner and its tables (`attnkit bench`)."""
