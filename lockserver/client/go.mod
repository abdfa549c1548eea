module github.com/distributed-lock-lab/distributed-lock-lab/lockserver/client

go 1.25

require github.com/distributed-lock-lab/distributed-lock-lab/lockserver/api v0.1.0

replace github.com/distributed-lock-lab/distributed-lock-lab/lockserver/api => ../api
