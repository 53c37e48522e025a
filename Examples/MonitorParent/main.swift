// Reproduces `MonitorParentProcess()` ("Monitoring a Process"): a child watches its parent with a PROC
// source on `getppid()` for `DISPATCH_PROC_EXIT`; the handler calls `MySetAppExitFlag`, then cancels
// and releases the source, which owns itself.
//
// On Linux: libdispatch has no process source; `ProcSource` watches a pidfd (pidfd_open(2)). To show a
// parent exiting, the program starts itself as the parent, which starts the watching child and exits
// once the child watches it; the first process relays what both print until both are gone.
//
// Usage: ExampleMonitorParent   (the arguments `parent` and `child` are for the processes it starts)

import GCD
import Glibc

/// Starts this program again with `role`, with `descriptor` as its descriptor `target`.
func spawnSelf(_ role: String, passing descriptor: Int32, as target: Int32) -> pid_t {
  var actions = posix_spawn_file_actions_t()
  posix_spawn_file_actions_init(&actions)
  posix_spawn_file_actions_adddup2(&actions, descriptor, target)
  let argv = [strdup("/proc/self/exe"), strdup(role), nil]
  var pid: pid_t = 0
  precondition(posix_spawn(&pid, "/proc/self/exe", &actions, nil, argv, environ) == 0, "posix_spawn failed")
  posix_spawn_file_actions_destroy(&actions)
  argv.forEach { free($0) }
  return pid
}

/// Prints `line` at once, in one `write`: three processes share the output.
func say(_ line: String) {
  _ = (line + "\n").withCString { write(STDOUT_FILENO, $0, strlen($0)) }
}

/// The application's exit flag: the child's main thread waits for it.
let exitFlag = try! Semaphore(value: 0)

func mySetAppExitFlag() { exitFlag.signal() }

func monitorParentProcess() {
  let parentPID = getppid()
  let queue = Queue.global(.default)
  guard let source = try? ProcSource(pid: parentPID, events: .exit, queue: queue) else {
    fatalError("child: cannot watch parent \(parentPID)")
  }
  // The handler's capture is the only reference to the source: cancelling it lets the source go.
  source.setEventHandler {
    say("child \(getpid()): parent \(source.pid) sent \(source.firedEvents); MySetAppExitFlag()")
    mySetAppExitFlag()
    source.cancel()
  }
  source.resume()
}

var ends: [Int32] = [-1, -1]
var byte: UInt8 = 0
switch CommandLine.arguments.dropFirst().first {
case "child":
  monitorParentProcess()
  say("child \(getpid()): watching parent \(getppid()) with ProcSource(pid: getppid(), events: .exit)")
  _ = write(3, "!", 1)  // tells the parent
  precondition(exitFlag.wait(timeout: .seconds(10)), "child: the parent's exit was not seen in 10 s")
  say("child \(getpid()): the exit flag is set; exiting")
case "parent":
  precondition(pipe(&ends) == 0, "pipe failed")
  let child = spawnSelf("child", passing: ends[1], as: 3)
  close(ends[1])
  _ = read(ends[0], &byte, 1)  // until the child watches this process
  say("parent \(getpid()): child \(child) watches me; exiting")
default:
  precondition(pipe(&ends) == 0, "pipe failed")
  let parent = spawnSelf("parent", passing: ends[1], as: STDOUT_FILENO)
  close(ends[1])
  say("started parent \(parent), which starts a child that watches it")
  while read(ends[0], &byte, 1) == 1 { _ = write(STDOUT_FILENO, &byte, 1) }  // until the parent and the child are gone
  waitpid(parent, nil, 0)
  say("parent and child are done")
}
