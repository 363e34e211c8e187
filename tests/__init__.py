"""The test suite: unit/, api/, store/ and process/ by what they prove; support/ the helpers
they share; apps/ the apps the servers they start serve."""
