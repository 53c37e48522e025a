// Main-actor code on the main thread: `Queue.dispatchMain { … }` runs the closure
// as a main-actor task and drains the main queue on the main thread, so
// the code after each `await` is back on the main thread (with a plain
// async main, Linux runs it on a worker thread).
import GCD

#if canImport(Glibc)
  import Glibc
#elseif canImport(Musl)
  import Musl
#endif

// Top-level code runs on the main thread.
let mainThread = pthread_self()

@MainActor enum Steps {
  static var onMainThread: [Bool] = []

  static func record(_ step: String) {
    // The thread whose id is the process id (gettid() == getpid()), checked two ways.
    let onMainThread = pthread_equal(pthread_self(), mainThread) != 0 && Queue.isMainThread
    Self.onMainThread.append(onMainThread)
    print("\(step): main thread: \(onMainThread)")
  }
}

Queue.dispatchMain {
  Steps.record("start")
  _ = await Queue.global().run { 6 * 7 }  // work elsewhere, then back on the main actor
  Steps.record("after await run")
  try await Task.sleep(for: .milliseconds(10))
  Steps.record("after sleep")
  await Task.detached { await Steps.record("called from a detached task") }.value
  if Steps.onMainThread.contains(false) {
    print("FAILED")
    exit(1)
  }
  print("every main-actor step ran on the main thread")
}
