-- The whole Lua side against tests/lua/fake_backend.lua: start, hello, run/update/done/error
-- events, cancel, artifacts, crash and restart, bang commands, card windows.
local t = ...

local dir = vim.fn.tempname()
vim.fn.mkdir(dir, 'p')
vim.env.XDG_STATE_HOME = dir .. '/state'
vim.env.XDG_LOG_FILE = nil
local bin = dir .. '/agent-bash'
vim.fn.writefile({
  '#!/bin/sh',
  'case "$1" in --version) echo "agent-bash 0.1.0"; exit 0;; esac',
  ('exec %s -ll %s "$@"'):format(vim.fn.shellescape(vim.v.progpath), vim.fn.shellescape(t.root .. '/tests/lua/fake_backend.lua')),
}, bin)
vim.fn.setfperm(bin, 'rwxr-xr-x')

local ab = require('agent_bash')
local backend = require('agent_bash.backend')
local float = require('agent_bash.float')
ab.setup({ bin = bin })

local notes = {}
vim.notify = function(msg, level)
  notes[#notes + 1] = { msg, level }
end

local function lines(buf)
  return vim.api.nvim_buf_get_lines(buf, 0, -1, false)
end

local function newest()
  local cards = float.cards()
  return cards[#cards]
end

local function call(params)
  local got = { updates = {}, done = {} }
  got.handle = ab.tool_call(params, {
    on_update = function(u)
      table.insert(got.updates, u)
    end,
    on_done = function(r)
      table.insert(got.done, r)
    end,
  })
  return got
end

local function press(card, lhs)
  local map = vim.api.nvim_buf_call(card.buf, function()
    return vim.fn.maparg(lhs, 'n', false, true)
  end)
  t.ok(map.callback, 'no mapping for ' .. lhs)
  map.callback()
end

t.describe('health', function()
  t.it(':checkhealth agent_bash reports versions, paths and a live ping', function()
    -- first: Neovim 0.11 asserts when a headless editor resized from 80x24 draws a tabline
    vim.cmd('silent checkhealth agent_bash')
    local text = table.concat(lines(0), '\n')
    vim.cmd('bwipe')
    backend.stop()
    t.ok(text:find('OK Neovim 0.11', 1, true) or text:find('OK Neovim 0.1', 1, true), text)
    t.ok(text:find('OK binary: ' .. bin, 1, true), text)
    t.ok(text:find('OK version: agent-bash 0.1.0', 1, true), text)
    t.ok(text:find('log file: ' .. dir .. '/state/nvim/agent_bash.log', 1, true), text)
    t.ok(text:find('OK ping: pong in', 1, true), text)
    t.ok(text:find('session id: ' .. backend.session_id(), 1, true), text)
    t.ok(text:find('bang commands: no g:agent_bash_profile, so the settings file decides', 1, true), text)
    t.ok(not text:find('ERROR', 1, true), text)
  end)
end)

t.describe('backend', function()
  t.it('moves the state of older versions into the one state directory', function()
    local old, new = backend.old_state_dir(), backend.state_dir()
    t.eq(dir .. '/state/nvim/agent_bash', old)
    t.eq(dir .. '/state/agent-bash', new)
    local function put(path, text)
      vim.fn.mkdir(vim.fn.fnamemodify(path, ':h'), 'p')
      vim.fn.writefile({ text }, path)
    end
    put(old .. '/sessions/s1/artifacts/0', 'old artifact')
    put(old .. '/changes/p1/HEAD', 'old receipts')
    put(old .. '/changes/p2/HEAD', 'old, taken')
    put(new .. '/changes/p2/HEAD', 'new')
    put(new .. '/editors/1.json', '{}')
    local left = backend.migrate_state(old, new)
    t.eq({ 'changes/p2/HEAD' }, left)
    t.eq({ 'old artifact' }, vim.fn.readfile(new .. '/sessions/s1/artifacts/0'))
    t.eq({ 'old receipts' }, vim.fn.readfile(new .. '/changes/p1/HEAD'))
    t.eq({ 'new' }, vim.fn.readfile(new .. '/changes/p2/HEAD'))
    t.eq(1, vim.fn.filereadable(new .. '/editors/1.json'))
    t.eq(0, vim.fn.isdirectory(old .. '/sessions'))
    vim.fn.delete(old .. '/changes/p2/HEAD')
    t.eq({}, backend.migrate_state(old, new))
    t.eq(0, vim.fn.isdirectory(old))
    vim.fn.delete(new .. '/sessions', 'rf')
    vim.fn.delete(new .. '/changes', 'rf')
  end)

  t.it('starts lazily with the contract argv and says hello', function()
    t.eq(nil, backend.info().chan)
    local ok, argv = backend.request('argv', {})
    t.ok(ok, argv)
    local sid = backend.session_id()
    t.ok(sid:match('^%d%d%d%d%d%d%d%d%-%d%d%d%d%d%d%-%d+$'), sid)
    t.eq({ '--log-file', dir .. '/state/nvim/agent_bash.log', 'nvim', '--state-dir', dir .. '/state/agent-bash', '--session-id', sid }, argv)
    t.eq(sid, backend.info().session_id)
    local info = backend.info()
    t.eq('0.1.0', info.version)
    t.eq('/tmp/fake-artifacts', info.session_dir)
    t.ok(info.pid > 0)
    t.eq({ true, 'pong' }, { backend.request('ping', {}) })
  end)

  t.it('passes --config after nvim', function()
    backend.stop()
    ab.setup({ settings_file = '/etc/ab.toml' })
    local _, argv = backend.request('argv', {})
    -- the same session id after a restart: the session keeps its artifacts and record
    t.eq({ '--log-file', dir .. '/state/nvim/agent_bash.log', 'nvim', '--config', '/etc/ab.toml', '--state-dir', dir .. '/state/agent-bash', '--session-id', backend.session_id() }, argv)
    require('agent_bash.config').options.settings_file = nil
  end)

  t.it('warns once when the versions differ', function()
    backend.stop()
    vim.env.FAKE_AGENT_BASH_VERSION = '9.9.9'
    notes = {}
    backend.request('ping', {})
    backend.stop()
    backend.request('ping', {})
    vim.env.FAKE_AGENT_BASH_VERSION = nil
    t.eq(1, #notes)
    t.eq(vim.log.levels.WARN, notes[1][2])
    t.ok(notes[1][1]:find('backend version 9.9.9 differs from the plugin version 0.1.0', 1, true), notes[1][1])
    backend.stop()
  end)

  t.it('reports a missing binary as a failed run', function()
    ab.setup({ bin = dir .. '/nope' })
    notes = {}
    local got = call({ command = 'echo hi' })
    t.eq(1, #got.done)
    t.ok(got.done[1].is_error)
    t.ok(got.done[1].output:find('^Bash command failed: agent%-bash binary is not executable: ' .. vim.pesc(dir)), got.done[1].output)
    t.eq(vim.log.levels.ERROR, notes[1][2])
    ab.setup({ bin = bin })
    ab.close_all()
  end)
end)

t.describe('tool_call', function()
  t.it('streams updates, then done; the card shows colours', function()
    vim.o.lines, vim.o.columns = 40, 120
    local got = call({ command = 'echo hi' })
    t.wait(function()
      return #got.done == 1
    end)
    t.eq(1, #got.updates)
    t.eq({ 'hi' }, got.updates[1].lines)
    t.eq(0, got.done[1].exit_code)
    t.eq('hi\n', got.done[1].output)
    local card = newest()
    t.eq({ '$ echo hi', 'hi' }, lines(card.buf))
    t.eq('agent_bash_card', vim.bo[card.buf].filetype)
    t.eq('nofile', vim.bo[card.buf].buftype)
    t.eq('hide', vim.bo[card.buf].bufhidden) -- a hidden card keeps it; closing deletes it
    local marks = vim.api.nvim_buf_get_extmarks(card.buf, -1, { 1, 0 }, { 1, -1 }, { details = true })
    t.eq('AgentBashAnsi_f2', marks[1][4].hl_group)
    t.ok(vim.api.nvim_get_hl(0, { name = 'AgentBashAnsi_f2' }).fg)
    local cfg = vim.api.nvim_win_get_config(card.win)
    t.eq(' ✓ ', cfg.title[1][1])
    t.ok(vim.api.nvim_get_current_win() ~= card.win, 'tool cards do not take focus')
  end)

  t.it('sends a profile and a remote cwd as given; :AgentBash honours b:/g:agent_bash_profile (contract §12)', function()
    local got = call({ command = 'echo hi', profile = 'dev', cwd = 'src' })
    t.wait(function()
      return #got.done == 1
    end)
    local _, last = backend.request('last_run', {})
    t.eq({ 'dev', 'src', 'tool' }, { last.profile, last.cwd, last.origin })
    t.eq('dev:$ cd src && echo hi', lines(newest().buf)[1])
    ab.close_all()
    local buf = vim.api.nvim_get_current_buf()
    local function bang_profile(want)
      ab.close_all()
      vim.api.nvim_set_current_buf(buf)
      ab.command('echo hi')
      local l
      local ok = pcall(t.wait, function()
        _, l = backend.request('last_run', {})
        return l.origin == 'bang' and l.profile == want
      end)
      t.ok(ok, vim.inspect(l))
      return l
    end
    vim.g.agent_bash_profile = 'box'
    -- The editor's directory goes along, marked as such: the backend, which knows where the
    -- profile runs, drops it for a remote session (tests/suite/editor.rs checks that).
    last = bang_profile('box')
    t.eq({ vim.fn.getcwd(), true }, { last.cwd, last.local_cwd })
    vim.b[buf].agent_bash_profile = 'buf'
    bang_profile('buf')
    vim.b[buf].agent_bash_profile = nil
    vim.g.agent_bash_profile = nil
    last = bang_profile(nil)
    t.eq(vim.fn.getcwd(), last.cwd)
    ab.close_all()
  end)

  t.it('validates params', function()
    t.raises(function()
      ab.tool_call({}, { on_done = function() end })
    end, 'params.command: expected a non-empty string')
    t.raises(function()
      ab.tool_call({ command = 'x', timeout = '5' }, { on_done = function() end })
    end, 'params.timeout: expected number')
    t.raises(function()
      ab.tool_call({ command = 'x', head = 0 }, { on_done = function() end })
    end, 'params.head: expected a positive integer')
    t.raises(function()
      ab.tool_call({ command = 'x', profile = 3 }, { on_done = function() end })
    end, 'params.profile: expected string')
    t.raises(function()
      ab.tool_call({ command = 'x' }, {})
    end, 'callbacks.on_done: expected callable')
  end)

  t.it('an error event gives an error result and a failed card', function()
    local got = call({ command = 'badcwd', cwd = 'sub/dir' })
    t.wait(function()
      return #got.done == 1
    end)
    t.eq('Working directory does not exist: /nope', got.done[1].output)
    t.ok(got.done[1].is_error)
    t.eq({ '$ cd sub/dir && badcwd', 'Bash command failed: Working directory does not exist: /nope' }, lines(newest().buf))
  end)

  t.it('cancel is safe twice; on_done runs once', function()
    local got = call({ command = 'sleep', timeout = 30 })
    t.wait(function()
      return #got.updates == 1
    end)
    got.handle:cancel()
    got.handle:cancel()
    t.wait(function()
      return #got.done == 1
    end)
    got.handle:cancel()
    vim.wait(50)
    t.eq(1, #got.done)
    t.ok(got.done[1].cancelled)
    t.eq(nil, got.done[1].exit_code) -- msgpack nil is nil, not vim.NIL
    -- unfocused, the hints name what works from the buffer; inside the card, its keys
    local id = newest().run.id
    local footer = vim.api.nvim_win_get_config(newest().win).footer
    t.eq((' [Timeout: 30s] · :AgentBashFocus %d · :AgentBashClose %d '):format(id, id), footer[1][1])
    vim.keymap.set('n', '<Space>f', '<Plug>(AgentBashFocus)')
    float.refresh(newest())
    footer = vim.api.nvim_win_get_config(newest().win).footer
    t.eq((' [Timeout: 30s] · <Space>f focus · :AgentBashClose %d '):format(id), footer[1][1])
    vim.keymap.del('n', '<Space>f')
    vim.cmd('AgentBashFocus ' .. id)
    t.eq(newest().win, vim.api.nvim_get_current_win())
    t.wait(function()
      return vim.api.nvim_win_get_config(newest().win).footer[1][1] == ' [Timeout: 30s] · y yank · <C-s> split · q close '
    end, 1000, 'the focused footer')
    vim.cmd('wincmd p')
  end)

  t.it('a truncated card loads the full artifact', function()
    local got = call({ command = 'many' })
    t.wait(function()
      return #got.done == 1
    end)
    local card = newest()
    local before = lines(card.buf)
    t.eq('[Full output: artifact://1. Truncated: 10 lines shown (50.0KB limit)]', before[#before])
    press(card, 'o')
    local after = lines(card.buf)
    t.eq(101, #after)
    t.eq('line 1', after[2])
    t.eq('line 100', after[101])
    press(card, '<Tab>')
    t.eq('… (90 earlier lines, showing 10 of 100) (<Tab> to expand)', lines(card.buf)[2])
  end)
end)

t.describe('artifact://', function()
  t.it('opens read-only', function()
    vim.cmd('edit artifact://1')
    local buf = vim.api.nvim_get_current_buf()
    t.eq(100, #lines(buf))
    t.eq('line 100', lines(buf)[100])
    t.eq('nofile', vim.bo[buf].buftype)
    t.eq(false, vim.bo[buf].modifiable)
    t.eq(true, vim.bo[buf].readonly)
    t.eq('agent_bash_artifact', vim.bo[buf].filetype)
  end)

  t.it('#L<a>-<b> jumps to the range and highlights it', function()
    -- A bare `#` on a command line is the alternate file: escape it, as fnameescape() does.
    vim.cmd('edit artifact://1\\#L10-20')
    local buf = vim.api.nvim_get_current_buf()
    t.eq(100, #lines(buf))
    t.eq({ 10, 0 }, vim.api.nvim_win_get_cursor(0))
    local ns = vim.api.nvim_get_namespaces().agent_bash_artifact_range
    local marks = vim.api.nvim_buf_get_extmarks(buf, ns, 0, -1, { details = true })
    t.eq(1, #marks)
    t.eq(9, marks[1][2])
    t.eq(19, marks[1][4].end_row)
    t.eq('AgentBashArtifactRange', marks[1][4].hl_group)
    vim.cmd.edit(vim.fn.fnameescape('artifact://1#L42'))
    t.eq({ 42, 0 }, vim.api.nvim_win_get_cursor(0))
  end)

  t.it('shows the exact error text (one message, no error raised) and an empty buffer', function()
    local function last_message()
      local out = vim.api.nvim_exec2('messages', { output = true }).output
      return out:match('[^\n]*$')
    end
    vim.cmd('edit artifact://8')
    t.eq('Artifact 8 not found. Available: 1', last_message())
    t.eq({ '' }, lines(0))
    vim.cmd('edit artifact://x')
    t.eq('artifact:// ID must be numeric, got: x', last_message())
  end)
end)

t.describe('bang commands', function()
  t.it('run side by side; cards leave the cursor; Esc in a focused card cancels, then closes', function()
    ab.close_all()
    local before = vim.api.nvim_get_current_win()
    vim.cmd('AgentBash sleep')
    local card = newest()
    t.eq(before, vim.api.nvim_get_current_win(), 'cards do not take the cursor')
    t.wait(function()
      return lines(card.buf)[2] == 'zzz'
    end)
    t.eq({ '$ sleep', 'zzz', ('Running… (:AgentBashCancel %d to cancel)'):format(card.run.id) }, lines(card.buf))
    notes = {}
    vim.cmd('AgentBash echo hi')
    t.eq({}, notes, 'a second command is not refused')
    t.eq(2, #float.cards())
    t.eq(before, vim.api.nvim_get_current_win())
    vim.api.nvim_set_current_win(card.win)
    t.wait(function()
      return lines(card.buf)[3] == 'Running… (<Esc> to cancel)'
    end, 1000, 'the focused hint')
    press(card, '<Esc>')
    t.wait(function()
      return lines(card.buf)[3] == '(cancelled)'
    end)
    t.eq(card.win, vim.api.nvim_get_current_win(), 'Esc on a running command only cancels it')
    press(card, '<Esc>')
    t.eq(before, vim.api.nvim_get_current_win())
    t.ok(card.closed, 'Esc on a finished card closes it')
    ab.close_all()
    t.eq(0, #float.cards())
  end)

  t.it(':AgentBash! is dimmed; :AgentBashCancel cancels', function()
    vim.cmd('AgentBash! sleep')
    local card = newest()
    t.eq('$ sleep · running · 0s · not in context ', vim.api.nvim_win_get_config(card.win).title[2][1])
    vim.cmd('AgentBashCancel')
    t.wait(function()
      return lines(card.buf)[#lines(card.buf)] == '(cancelled)'
    end)
    local marks = vim.api.nvim_buf_get_extmarks(card.buf, -1, 0, -1, { details = true })
    for _, m in ipairs(marks) do
      t.eq('AgentBashDim', m[4].hl_group)
    end
    notes = {}
    vim.cmd('AgentBashCancel')
    t.eq({ { 'agent-bash: no bash command is running', vim.log.levels.INFO } }, notes)
    ab.close_all()
  end)
end)

t.describe('cards', function()
  t.it('stack without overlapping and re-layout on resize', function()
    ab.close_all()
    for _ = 1, 3 do
      call({ command = 'fail' })
    end
    t.wait(function()
      return #float.cards() == 3 and lines(newest().buf)[2] == 'oops'
    end)
    local function boxes()
      local out = {}
      for _, c in ipairs(float.cards()) do
        local pos = vim.api.nvim_win_get_position(c.win)
        local cfg = vim.api.nvim_win_get_config(c.win)
        out[#out + 1] = { top = pos[1], bottom = pos[1] + cfg.height + 2, left = pos[2], right = pos[2] + cfg.width + 2 }
      end
      return out
    end
    local b = boxes()
    t.ok(b[1].bottom <= b[2].top and b[2].bottom <= b[3].top, vim.inspect(b))
    t.ok(b[3].right <= 120 and b[3].bottom <= 40 - 2, vim.inspect(b))
    vim.o.columns = 90
    vim.api.nvim_exec_autocmds('VimResized', {})
    t.ok(boxes()[3].right <= 90, vim.inspect(boxes()))
    vim.o.columns = 120
  end)

  t.it('older cards close when there is no room', function()
    vim.o.lines = 7 -- room for one 2-line card and its border above the status and command lines
    vim.api.nvim_exec_autocmds('VimResized', {})
    t.eq(1, #float.cards())
    t.eq(1, vim.api.nvim_win_get_position(newest().win)[1])
    vim.o.lines = 40
    ab.close_all()
  end)

  t.it("honours 'winborder'; without edges the title and footer become text lines", function()
    if vim.fn.exists('+winborder') == 0 then
      return
    end
    vim.o.winborder = 'single'
    call({ command = 'fail' })
    t.wait(function()
      return lines(newest().buf)[2] == 'oops'
    end)
    t.eq('┌', vim.api.nvim_win_get_config(newest().win).border[1])
    ab.close_all()
    vim.o.winborder = 'none'
    call({ command = 'fail', timeout = 5 })
    t.wait(function()
      return lines(newest().buf)[3] == 'oops'
    end)
    local card = newest()
    t.eq(nil, vim.api.nvim_win_get_config(card.win).title)
    t.eq({ ' ✗ $ fail · exit 1 · 3ms ', '$ fail', 'oops', (' [Timeout: 5s] · :AgentBashFocus %d · :AgentBashClose %d '):format(card.run.id, card.run.id) }, lines(card.buf))
    t.eq(4, vim.api.nvim_win_get_config(card.win).height)
    ab.close_all()
    vim.o.winborder = ''
  end)
end)

t.describe('crash', function()
  t.it('reports once, fails running runs, restarts on the next command', function()
    local sleeping = call({ command = 'sleep' })
    t.wait(function()
      return #sleeping.updates == 1
    end)
    notes = {}
    call({ command = 'die' })
    t.wait(function()
      return #sleeping.done == 1
    end)
    t.eq('Bash command failed: backend exited', sleeping.done[1].output)
    t.eq(1, #notes)
    t.eq(vim.log.levels.WARN, notes[1][2])
    t.eq(
      ('agent-bash: backend exited (code 3); it restarts on the next command. Log: %s/state/nvim/agent_bash.log'):format(dir),
      notes[1][1]
    )
    t.eq(nil, backend.info().chan)
    local again = call({ command = 'echo hi' })
    t.wait(function()
      return #again.done == 1
    end)
    t.eq(0, again.done[1].exit_code)
    backend.stop()
  end)
end)
