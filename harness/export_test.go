package harness

// ReadEvents exposes readEvents to the tests of package harness_test.
var ReadEvents = readEvents
