"""The `zllm` command line. stdout is data, stderr is for people; exit codes 0 ok / 1 failure / 2 usage."""
