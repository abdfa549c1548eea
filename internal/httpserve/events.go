package httpserve

// EventServerError (WARN) is the event of net/http's own complaints (a
// panicking handler, a failed accept), logged through Server.ErrorLog.
const EventServerError = "http_server_error"
