from reconcile_host.cli import main

main()
