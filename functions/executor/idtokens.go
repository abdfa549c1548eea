package executor

// EnvIDTokens, read by cmd/executor (true or false, default false), adds a
// Cloud Run ID token to every call to payment-resource and rail-proxy
// (package internal/idtokens): set on Cloud Run, where both are private
// services that only the executor's identity may invoke. lock-server,
// reached over the VPC, gets no token.
const EnvIDTokens = "EXECUTOR_ID_TOKENS"
