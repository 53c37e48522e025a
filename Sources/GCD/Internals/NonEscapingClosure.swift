// The one hack in the package: handing a non-escaping Swift closure to a C
// function without allocating.
//
// `sync` and `apply` must run a non-escaping closure through
// `dispatch_sync_f` / `dispatch_apply_f`. `withoutActuallyEscaping` would
// allocate a wrapper per call (measured: 1 allocation, ~4x the C call), and
// a closure-to-block conversion copies the block. Instead the closure is
// passed, as Swift passes any closure argument, as two words (its function
// and its context) to C functions declared here with `@_silgen_name`, so
// Swift calls them with the Swift calling convention: `cgcd_sync`,
// `cgcd_sync_here` and `cgcd_apply` in CGCD.c, which are `swiftcall` C
// functions and call the closure back with its context in the Swift
// context register.
//
// That layout is what the Swift compiler emits for a non-escaping closure
// argument on Linux today; Swift promises ABI stability on Apple platforms
// only, so nothing guarantees it here. The suite `NonEscapingClosureTests`
// calls each entry point with closures that capture, return, throw and
// nest, each in a child process, so a change of convention fails those
// tests loudly instead of corrupting a user's program.

/// `dispatch_sync_f` (or `dispatch_barrier_sync_f` when `barrier` is 1) of
/// `body` onto `queue`, inside a frame linked to the caller's chain.
@usableFromInline
@_silgen_name("cgcd_sync")
func cgcdSync(_ queue: UnsafeMutableRawPointer, _ flags: UInt, _ barrier: UInt, _ body: () -> Void)

/// `cgcdSync` for a thread with no frame onto a queue whose work runs on
/// the calling thread: the frame is set around the wait.
@usableFromInline
@_silgen_name("cgcd_sync_here")
func cgcdSyncHere(_ queue: UnsafeMutableRawPointer, _ flags: UInt, _ barrier: UInt, _ body: () -> Void)

/// `dispatch_async_and_wait_f` (or `dispatch_barrier_async_and_wait_f` when
/// `barrier` is 1) of `body` onto `queue`, inside a frame linked to the caller's chain.
@usableFromInline
@_silgen_name("cgcd_async_and_wait")
func cgcdAsyncAndWait(_ queue: UnsafeMutableRawPointer, _ flags: UInt, _ barrier: UInt, _ body: () -> Void)

/// `dispatch_apply_f` of `body`, each iteration inside a frame linked to the caller's chain.
@usableFromInline
@_silgen_name("cgcd_apply")
func cgcdApply(
  _ iterations: Int, _ queue: UnsafeMutableRawPointer, _ flags: UInt, _ body: @Sendable (Int) -> Void)
