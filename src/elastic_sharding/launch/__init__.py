"""One command per launch mode, each driving prepare, workers and finish on the same claims:
`dlc` (the same command on every node), `mpi` (one command on an MPIJob's launcher), `local`
(one machine), `two_node` (the original demo's strict wrapper); `steps` is what they share."""
