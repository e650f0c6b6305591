from edgedeploy.cli import main

raise SystemExit(main())
