from tritonbundle.cli import main

raise SystemExit(main())
