#compdef zllm

_zllm_completion() {
  eval $(env _TYPER_COMPLETE_ARGS="${words[1,$CURRENT]}" _ZLLM_COMPLETE=complete_zsh zllm)
}

compdef _zllm_completion zllm
