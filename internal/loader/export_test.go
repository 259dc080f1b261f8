package loader

// SetAfterMigrationCopy sets the hook run between a migration's copy and
// the load of the programs, until the test ends.
func SetAfterMigrationCopy(cleanup func(func()), f func()) {
	afterMigrationCopy = f
	cleanup(func() { afterMigrationCopy = nil })
}
