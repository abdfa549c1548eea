# One image per command of the repository: lock-server for GKE, and each
# payout function for Cloud Run (functions/serve inside; Cloud Run
# sets $PORT). cloudbuild.yaml builds it once per command:
#   docker build --build-arg CMD=lockserver/cmd/lock-server -t .../lock-server:$COMMIT_SHA .
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
# The SDK's modules, which go.mod replaces with these folders (their
# go.mod files only: they require nothing to download).
COPY lockserver/api/go.mod lockserver/api/
COPY lockserver/client/go.mod lockserver/client/
RUN go mod download
COPY . .
ARG CMD
RUN test -n "$CMD" && CGO_ENABLED=0 go build -trimpath -o /out/app "./$CMD"

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/app /app
USER 65532:65532
ENTRYPOINT ["/app"]
