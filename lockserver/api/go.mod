module github.com/distributed-lock-lab/distributed-lock-lab/lockserver/api

go 1.25
