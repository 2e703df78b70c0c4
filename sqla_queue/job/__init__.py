"""The job core both runners share: a job's states, its options, its context and how it runs."""
