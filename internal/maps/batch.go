package maps

import "fmt"

// batchSize bounds one batch syscall.
const batchSize = 4096

// putBatches writes e in order, batchSize pairs per call.
func putBatches[K comparable, V any](m Map[K, V], e *entries[K, V]) error {
	for i := 0; i < len(e.keys); i += batchSize {
		end := min(i+batchSize, len(e.keys))
		if n, err := m.PutBatch(e.keys[i:end], e.values[i:end]); err != nil {
			return fmt.Errorf("after %d of %d updates: %w", i+n, len(e.keys), err)
		}
	}
	return nil
}

// deleteBatches deletes keys in order, batchSize per call.
func deleteBatches[K comparable, V any](m Map[K, V], keys []K) error {
	for i := 0; i < len(keys); i += batchSize {
		end := min(i+batchSize, len(keys))
		if n, err := m.DeleteBatch(keys[i:end]); err != nil {
			return fmt.Errorf("after %d of %d deletions: %w", i+n, len(keys), err)
		}
	}
	return nil
}
