package serve

// Run is run, for the external tests.
var Run = run
