-- Building the backend: how the plugin was installed (lazy.nvim from a local `dir` or a git URL,
-- packer, vim-plug, a Neovim package, a plain 'runtimepath' entry), what to say when the binary
-- is missing, and `:AgentBashBuild` (`cargo build --release` in a terminal float, then the bang
-- command that found no binary runs).

local M = {}
local H = {}

--- The build command, run in the plugin's root.
M.CMD = { 'cargo', 'build', '--release' }

---@class agent_bash.Install
---@field manager 'lazy'|'packer'|'vim-plug'|'pack'|'rtp'
---@field name? string the plugin's name in its manager
---@field is_local? boolean lazy.nvim: loaded from a `dir` (lazy never builds those by itself)
---@field build? any lazy.nvim: the spec's `build`

--- How the plugin at `root` was installed, from what the plugin managers leave in the editor.
---@param root? string default: the plugin's root
---@return agent_bash.Install
function M.install(root)
  root = H.real(root or require('agent_bash.backend').root())
  -- lazy.nvim keeps its plugins, by name, in lazy.core.config.plugins (loaded when lazy is used).
  local lazy = package.loaded['lazy.core.config']
  if type(lazy) == 'table' and type(lazy.plugins) == 'table' then
    for name, p in pairs(lazy.plugins) do
      if type(p) == 'table' and type(p.dir) == 'string' and H.real(p.dir) == root then
        local state = type(p._) == 'table' and p._ or {}
        return { manager = 'lazy', name = p.name or name, is_local = state.is_local == true, build = p.build }
      end
    end
  end
  -- packer.nvim: the global packer_plugins, name → { path = … }.
  if type(_G.packer_plugins) == 'table' then
    for name, p in pairs(_G.packer_plugins) do
      if type(p) == 'table' and type(p.path) == 'string' and H.real(p.path) == root then
        return { manager = 'packer', name = name }
      end
    end
  end
  -- vim-plug: g:plugs, name → { dir = … }.
  local plugs = vim.g.plugs
  if type(plugs) == 'table' then
    for name, p in pairs(plugs) do
      if type(p) == 'table' and type(p.dir) == 'string' and H.real(p.dir) == root then
        return { manager = 'vim-plug', name = name }
      end
    end
  end
  -- A Neovim package (pack/*/start|opt/*: by hand, paq-nvim, mini.deps, vim.pack).
  if root:match('/pack/[^/]+/start/[^/]+$') or root:match('/pack/[^/]+/opt/[^/]+$') then
    return { manager = 'pack' }
  end
  return { manager = 'rtp' }
end

--- What to do when the binary is missing, for the way the plugin was installed: one line each,
--- the manager's own way first.
---@param install? agent_bash.Install
---@return string[]
function M.advice(install)
  install = install or M.install()
  local root = require('agent_bash.backend').root()
  local here = ':AgentBashBuild builds it now in a terminal (the command you typed then runs)'
  local by_hand = ('or by hand: cd %s && cargo build --release'):format(vim.fn.fnameescape(root))
  local name = install.name or 'agent-bash'
  local lines
  if install.manager == 'lazy' and install.is_local then
    lines = {
      ('lazy.nvim never builds a plugin it loads from `dir`: run :Lazy build %s (the command you typed then runs)'):format(name),
      here,
    }
  elseif install.manager == 'lazy' and install.build == nil then
    lines = {
      ('your lazy.nvim spec for %s has no `build`: add build = "cargo build --release", then :Lazy build %s'):format(name, name),
      here,
    }
  elseif install.manager == 'lazy' then
    lines = {
      ('the build lazy.nvim runs on install did not leave it there: :Lazy build %s runs it again and shows why'):format(name),
      here,
    }
  elseif install.manager == 'packer' then
    lines = {
      "packer.nvim builds what its spec says: add run = 'cargo build --release' to its use{}, then :PackerSync",
      here,
    }
  elseif install.manager == 'vim-plug' then
    lines = {
      ("vim-plug builds what its Plug line says: add { 'do': 'cargo build --release' }, then :PlugInstall! %s"):format(name),
      here,
    }
  elseif install.manager == 'pack' then
    lines = { 'a Neovim package has no build step: ' .. here }
  else
    lines = { here }
  end
  table.insert(lines, by_hand)
  return lines
end

--- The error for a missing binary: where it was looked for and how to build it, a line each
--- (the card shows them as lines, not one wrapped paragraph).
---@param looked string the path looked at before $PATH
---@return string
function M.missing(looked)
  local lines = { ('backend binary not found (looked at %s and $PATH):'):format(looked) }
  vim.list_extend(lines, M.advice())
  table.insert(lines, 'or set `bin` in setup()')
  return table.concat(lines, '\n')
end

--- Remembers the bang command that found no binary: a successful `:AgentBashBuild` runs it,
--- and so does lazy.nvim's `:Lazy build` (install, update, sync) once the binary is there.
--- Only the newest one waits.
---@param fn fun()
function M.wait(fn)
  H.pending = fn
  if package.loaded['lazy'] and not H.lazy_hook then
    -- lazy.nvim fires User Lazy<Mode> when a build, install, update or sync has finished.
    H.lazy_hook = vim.api.nvim_create_autocmd('User', {
      pattern = { 'LazyBuild', 'LazyInstall', 'LazyUpdate', 'LazySync' },
      desc = 'agent-bash: run the command that waited for the backend binary',
      callback = function()
        if H.pending and require('agent_bash.backend').bin() then
          H.resume()
        end
      end,
    })
  end
end

---@class agent_bash.Build
---@field buf integer the terminal buffer (kept after the build until the next one)
---@field win? integer the float, while open
---@field job integer
---@field code? integer the exit code once it ended
---@field cmd string[]

--- The current or last build, if any.
---@return agent_bash.Build?
function M.last()
  return H.build
end

--- `:AgentBashBuild`: builds the backend in the plugin's root in a terminal float showing
--- cargo's progress. When it succeeds the float closes, a running backend restarts on the new
--- binary (once its commands end), and the bang command that found no binary runs. A failed
--- build keeps its float open (`q` closes it). While a build runs, focuses its float.
---@return boolean started
function M.command()
  local b = H.build
  if b and not b.code then
    H.show(b)
    if b.win and vim.api.nvim_win_is_valid(b.win) then
      vim.api.nvim_set_current_win(b.win)
    end
    vim.notify('agent-bash: the build is still running', vim.log.levels.INFO)
    return false
  end
  if vim.fn.executable(M.CMD[1]) ~= 1 then
    vim.notify(
      ('agent-bash: %s not found on $PATH: install Rust (https://rustup.rs), then :AgentBashBuild'):format(M.CMD[1]),
      vim.log.levels.ERROR
    )
    return false
  end
  if b then
    H.discard(b)
  end
  local root = require('agent_bash.backend').root()
  b = { buf = vim.api.nvim_create_buf(false, true), cmd = M.CMD }
  H.build = b
  vim.bo[b.buf].bufhidden = 'hide'
  H.show(b)
  local opts = {
    cwd = root,
    -- The binary must land where the plugin looks, whatever CARGO_TARGET_DIR says.
    env = { CARGO_TARGET_DIR = root .. '/target' },
    on_exit = function(_, code)
      vim.schedule(function()
        H.done(b, code)
      end)
    end,
  }
  local ok, job = pcall(vim.api.nvim_win_call, b.win, function()
    if vim.fn.has('nvim-0.11') == 1 then
      opts.term = true
      return vim.fn.jobstart(b.cmd, opts)
    end
    return vim.fn.termopen(b.cmd, opts)
  end)
  if not ok or type(job) ~= 'number' or job <= 0 then
    H.discard(b)
    H.build = nil
    vim.notify(('agent-bash: could not start %s: %s'):format(table.concat(M.CMD, ' '), tostring(job)), vim.log.levels.ERROR)
    return false
  end
  b.job = job
  vim.keymap.set('n', 'q', function()
    H.close(b)
  end, { buffer = b.buf, nowait = true, desc = 'agent-bash: close the build float' })
  return true
end

-- Helpers -----------------------------------------------------------------------------------

H.pending = nil ---@type fun()?
H.build = nil ---@type agent_bash.Build?
H.lazy_hook = nil ---@type integer?

function H.real(path)
  local p = vim.uv.fs_realpath(vim.fn.expand(path)) or vim.fs.normalize(path)
  return (p:gsub('/+$', ''))
end

function H.title(b)
  local what = table.concat(b.cmd, ' ')
  if not b.code then
    return (' agent-bash: %s (building…) '):format(what)
  elseif b.code == 0 then
    return (' agent-bash: %s ✓ '):format(what)
  end
  return (' agent-bash: %s ✗ exit %d · q closes '):format(what, b.code)
end

--- Opens (or re-opens) the float on the build's buffer: 80% of the editor, centered, not
--- entered (the editor stays usable while cargo works).
function H.show(b)
  if b.win and vim.api.nvim_win_is_valid(b.win) then
    return
  end
  local frame = require('agent_bash.float').frame()
  local top = frame.top
  local bottom = vim.o.lines - vim.o.cmdheight - (vim.o.laststatus > 0 and 1 or 0)
  local width = math.max(1, math.min(vim.o.columns - frame.cols, math.floor(vim.o.columns * 0.8)))
  local height = math.max(1, math.min(bottom - top - frame.rows, math.floor((bottom - top) * 0.8)))
  local cfg = {
    relative = 'editor',
    row = top + math.max(0, math.floor((bottom - top - height - frame.rows) / 2)),
    col = math.max(0, math.floor((vim.o.columns - width - frame.cols) / 2)),
    width = width,
    height = height,
    style = 'minimal',
    border = frame.border,
    focusable = true,
    zindex = 60,
  }
  if frame.full then
    cfg.title, cfg.title_pos = H.title(b), 'left'
  end
  b.win = vim.api.nvim_open_win(b.buf, false, cfg)
end

function H.close(b)
  if b.win and vim.api.nvim_win_is_valid(b.win) then
    pcall(vim.api.nvim_win_close, b.win, true)
  end
  b.win = nil
end

function H.discard(b)
  H.close(b)
  if vim.api.nvim_buf_is_valid(b.buf) then
    pcall(vim.api.nvim_buf_delete, b.buf, { force = true })
  end
end

function H.done(b, code)
  b.code = code
  local backend = require('agent_bash.backend')
  local bin = backend.bin()
  if code ~= 0 or not bin then
    if b.win and vim.api.nvim_win_is_valid(b.win) and require('agent_bash.float').frame().full then
      pcall(vim.api.nvim_win_set_config, b.win, { title = H.title(b), title_pos = 'left' })
    end
    vim.notify(
      code ~= 0 and ('agent-bash: the build failed (exit %d): its output is in the float; q closes it'):format(code)
        or ('agent-bash: the build ended but left no binary: ' .. select(2, backend.bin())),
      vim.log.levels.ERROR
    )
    return
  end
  H.close(b)
  vim.notify('agent-bash: backend built: ' .. bin, vim.log.levels.INFO)
  if backend.info().chan then
    backend.restart({ quiet = true }) -- the new binary, once running commands end
  end
  H.resume()
end

--- Runs the command that waited for the binary, if any.
function H.resume()
  local pending = H.pending
  H.pending = nil
  if pending then
    pending()
  end
end

return M
