from zllm.cli.app import main

main()
